"""The `profile` tool's reading of Nsight Compute's raw CSV page (`tools.ncu`).

The pages here are built to the layout ncu documents and prints for `--page raw --csv`: a header
row of metric names after the launch's own columns, a row of units, one row per profiled launch;
ncu's own `==PROF==` lines before it. The metric names are ncu's (SpeedOfLight, Occupancy,
LaunchStats, WarpStateStats sections); values are made up, so the expected figures are known."""

from __future__ import annotations

import csv
import io

from services.evaluator.tools import ncu

LAUNCH_COLUMNS = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
                  "Block Size", "Grid Size", "Device", "CC"]
METRICS = {  # name -> (unit, value of launch 0, value of launch 1)
    "gpu__time_duration.sum": ("nsecond", "42,816", "5,120"),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "85.02", "12.5"),
    "dram__bytes.sum.per_second": ("byte/second", "2848000000000", "410000000000"),
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "40.11", "8"),
    "lts__t_bytes.sum.per_second": ("byte/second", "3100000000000", "500000000000"),
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "85.02", "12.5"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "12.3", "3.1"),
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "0", "0"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "78.1", "20"),
    "sm__maximum_warps_per_active_cycle_pct": ("%", "100", "50"),
    "launch__occupancy_limit_blocks": ("block", "32", "32"),
    "launch__occupancy_limit_registers": ("block", "8", "4"),
    "launch__occupancy_limit_shared_mem": ("block", "16", "32"),
    "launch__occupancy_limit_warps": ("block", "4", "8"),
    "launch__registers_per_thread": ("register/thread", "16", "64"),
    "launch__shared_mem_per_block_static": ("byte", "1024", "0"),
    "launch__shared_mem_per_block_dynamic": ("byte", "0", "0"),
    "launch__waves_per_multiprocessor": ("", "12.4", "1"),
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("ratio", "6", "1"),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("ratio", "2", "1"),
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("ratio", "1", "1"),
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio": ("ratio", "1", "1"),
    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio": ("ratio", "1", "1"),
}


def page(metrics: dict = METRICS, kernels=("rmsnorm", "scale")) -> str:
    out = io.StringIO()
    out.write("==PROF== Connected to process 4242 (/usr/bin/python3.12)\n==PROF== Profiling \"rmsnorm\": 0%....100%\n")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(LAUNCH_COLUMNS + list(metrics))
    writer.writerow([""] * len(LAUNCH_COLUMNS) + [unit for unit, *_ in metrics.values()])
    for i, kernel in enumerate(kernels):
        writer.writerow([str(i), "4242", "python3.12", "127.0.0.1", kernel, "1", "7", "(256, 1, 1)", "(4096, 1, 1)",
                         "0", "9.0"] + [values[i] for _unit, *values in metrics.values()])
    out.write("==PROF== Disconnected from process 4242\n")
    return out.getvalue()


def test_each_launch_is_read_with_its_metrics_and_units():
    launches = ncu.parse(page())
    assert [launch.kernel for launch in launches] == ["rmsnorm", "scale"]
    assert launches[0].duration_ns() == 42816.0  # thousands separator dropped
    assert launches[0].grid == "(4096, 1, 1)" and launches[0].block == "(256, 1, 1)"
    assert round(launches[0].rate_gbps(ncu.DRAM_RATE, ncu.DRAM_BYTES)) == 2848


def test_summary_gives_the_figures_a_writer_needs():
    text = ncu.summary(ncu.parse(page()), dram_peak_gbps=3350.0)
    assert "one call: 2 launches, 0.04794 ms of kernel time" in text
    assert "launch 0: rmsnorm grid (4096, 1, 1) block (256, 1, 1): 0.04282 ms" in text
    assert "DRAM 85.0% (2848 of 3350 GB/s)" in text
    assert "L2 40.1% (3100 GB/s)" in text and "SM 12.3%" in text and "tensor pipe 0.0%" in text
    assert "achieved 78.1%, theoretical 100.0%, limited by warps" in text
    assert "16 registers/thread, 1024 B static smem/block, 0 B dynamic smem/block, 12.4 waves/SM" in text
    # shares of the stall reasons, `selected` (issuing) left out: 6 / (6 + 2 + 1 + 1)
    assert "top warp stalls (share of stall cycles): long_scoreboard 60%, barrier 20%" in text
    assert "selected 10%" not in text.replace("not_selected", "")
    assert "not reported" not in text
    assert text.index("launch 0:") < text.index("launch 1:")  # longest first
    assert len(text) < 1500  # a few hundred tokens


def test_a_metric_ncu_did_not_give_is_named_missing_never_guessed():
    kept = {k: v for k, v in METRICS.items() if "stalled" not in k and "tensor" not in k and "lts__" not in k}
    text = ncu.summary(ncu.parse(page(kept, kernels=("scale",))))
    assert "not reported by ncu here: L2, tensor pipe, warp stall reasons" in text
    assert "warp stalls: none reported" in text


def test_other_units_are_converted():
    metrics = dict(METRICS)
    metrics["gpu__time_duration.sum"] = ("usecond", "42.82", "5.12")
    metrics["dram__bytes.sum.per_second"] = ("Tbyte/second", "2.85", "0.41")
    launches = ncu.parse(page(metrics))
    assert launches[0].duration_ns() == 42820.0
    assert round(launches[0].rate_gbps(ncu.DRAM_RATE)) == 2850


def test_bandwidth_from_bytes_where_no_rate_is_given():
    metrics = {k: v for k, v in METRICS.items() if k != "dram__bytes.sum.per_second"}
    metrics["dram__bytes.sum"] = ("byte", "121,942,016", "2,000")
    launch = ncu.parse(page(metrics))[0]
    assert round(launch.rate_gbps(ncu.DRAM_RATE, ncu.DRAM_BYTES)) == round(121942016 / 42816)


def test_output_without_a_page_is_refused_and_no_launch_is_said_so():
    try:
        ncu.parse("==ERROR== the application returned an error code (1)\n")
    except ValueError:
        pass
    else:
        raise AssertionError("a page without a header row was read")
    assert "no kernel launch" in ncu.summary([])


def test_the_command_profiles_only_the_range_at_the_gpus_clocks(tmp_path):
    command = ncu.command("/usr/local/cuda/bin/ncu", ["python", "-m", "target", "job.json"], tmp_path / "log.csv")
    pairs = set(zip(command, command[1:]))
    assert {("--profile-from-start", "off"), ("--clock-control", "none"), ("--cache-control", "all"),
            ("--page", "raw"), ("--log-file", str(tmp_path / "log.csv"))} <= pairs
    assert {name for flag, name in pairs if flag == "--section"} == set(ncu.SECTIONS)
    assert command[-4:] == ["python", "-m", "target", "job.json"]


def test_stall_reasons_of_another_spelling_are_read_too():
    metrics = {k: v for k, v in METRICS.items() if "stalled" not in k}
    metrics["smsp__warps_issue_stalled_math_pipe_throttle_per_warp_active.pct"] = ("%", "30", "1")
    metrics["smsp__warps_issue_stalled_short_scoreboard_per_warp_active.pct"] = ("%", "10", "1")
    text = ncu.summary(ncu.parse(page(metrics)))
    assert "top warp stalls (share of stall cycles): math_pipe_throttle 75%, short_scoreboard 25%" in text
