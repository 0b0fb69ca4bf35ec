# Standalone check of the cuda seeds on a GPU (no pydantic/pycuda needed): correctness against the
# reference on every workload for every tunable combination (default first), timing vs eager ref.
import json, sys, os, itertools, subprocess, types, time, math
import numpy as np, torch, cupy as cp

DT = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16, "int64": torch.int64,
      "int32": torch.int32, "float8_e4m3fn": torch.float8_e4m3fn, "int8": torch.int8, "bool": torch.bool}
dev = torch.device("cuda")

class Kernels:
    def __init__(self, path):
        self.mod = cp.RawModule(path=path)
        self.fs = {}
    def __getattr__(self, name):
        if name.startswith("_"): raise AttributeError(name)
        f = self.mod.get_function(name)
        def call(*args, grid, block, shared_mem=0):
            a = []
            for v in args:
                if isinstance(v, torch.Tensor): a.append(np.uint64(v.data_ptr()))
                elif isinstance(v, bool): a.append(np.int32(v))
                elif isinstance(v, int): a.append(np.int32(v))
                elif isinstance(v, float): a.append(np.float32(v))
                else: a.append(v)
            g = tuple(int(x) for x in grid) + (1,) * (3 - len(grid))
            b = tuple(int(x) for x in block) + (1,) * (3 - len(block))
            f(g, b, tuple(a), shared_mem=shared_mem)
        return call

def resolve(defn, wax):
    v = {n: a["value"] for n, a in defn["axes"].items() if a["type"] == "const"}
    v.update(wax)
    for _ in range(5):
        for n, a in defn["axes"].items():
            if a["type"] == "expr" and n not in v:
                try: v[n] = int(eval(a["expression"], {}, dict(v)))
                except NameError: pass
    return v

def make_inputs(defn, ref, axes, seed):
    if defn.get("custom_inputs_entrypoint"):
        torch.manual_seed(seed)
        d = getattr(ref, defn["custom_inputs_entrypoint"])(dict(axes), dev)
        return [d[n] for n in defn["inputs"]]
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, s in defn["inputs"].items():
        shape = tuple(int(a) if a.isdigit() else axes[a] for a in s["shape"])
        dt = DT[s["dtype"]]
        if dt.is_floating_point: t = torch.randn(shape, generator=g, dtype=torch.float32).to(dt)
        else: t = torch.randint(-64, 64, shape, generator=g, dtype=dt)
        out.append(t.to(dev))
    return out

def compare(a, e, tol):
    a = a.detach().double(); e = e.detach().double()
    err = (a - e).abs()
    bound = tol.get("max_atol", 1e-2) + tol.get("max_rtol", 1e-2) * e.abs()
    ok = (err <= bound) & torch.isfinite(e)
    ok |= torch.isinf(e) & (a == e)
    err = torch.where(torch.isnan(a) | torch.isnan(e), torch.full_like(err, float("inf")), err)
    ratio = ok.float().mean().item() if ok.numel() else 1.0
    worst = int(err.flatten().argmax()) if err.numel() else 0
    return ratio >= tol.get("required_matched_ratio", 1.0), ratio, err.max().item() if err.numel() else 0, \
        (a.flatten()[worst].item(), e.flatten()[worst].item()) if err.numel() else None

def bench(fn, iters=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ts = []
    for i in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts) // 2]

def main(prob_dir, all_combos, do_compile):
    defn = json.load(open(f"{prob_dir}/definition.json"))
    wls = [json.loads(l) for l in open(f"{prob_dir}/workload.jsonl") if l.strip()]
    sol = json.load(open(f"{prob_dir}/solutions/cuda_seed.json"))
    ref = types.ModuleType("ref"); exec(defn["reference"], ref.__dict__)
    tun = sol["spec"]["tunables"]; names = list(tun)
    combos = list(itertools.product(*[tun[n] for n in names]))
    if not all_combos: combos = combos[:1]
    wd = f"/tmp/build/{defn['name']}"; os.makedirs(wd, exist_ok=True)
    for s in sol["sources"]: open(f"{wd}/{s['path']}", "w").write(s["content"])
    print(f"=== {defn['name']}", flush=True)
    ref_times = {}
    cref = torch.compile(ref.run) if do_compile else None
    for combo in combos:
        vals = dict(zip(names, combo))
        defs = [f"-D{n}={int(v) if isinstance(v, bool) else v}" for n, v in vals.items()]
        cub = f"{wd}/k_{'_'.join(str(c) for c in combo)}.cubin"
        r = subprocess.run(["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", *defs,
                            "-o", cub, f"{wd}/kernel.cu"], capture_output=True, text=True)
        if r.returncode: print("COMPILE FAIL", vals, r.stderr[-1500:]); continue
        K = Kernels(cub)
        lm = types.ModuleType("launch"); lm.__dict__.update(vals)
        exec([s["content"] for s in sol["sources"] if s["path"] == "launch.py"][0], lm.__dict__)
        line = []
        for w in wls:
            axes = resolve(defn, w["axes"])
            try:
                inp = make_inputs(defn, ref, axes, 1234)
                with torch.no_grad(): exp = ref.run(*inp)
                if isinstance(exp, torch.Tensor): exp = (exp,)
                outs = []
                for (on, os_), e in zip(defn["outputs"].items(), exp):
                    t = torch.empty_like(e)
                    if t.is_floating_point(): t.fill_(float("nan"))
                    else: t.fill_(-7)
                    outs.append(t)
                lm.run(*inp, *outs, kernels=K); torch.cuda.synchronize()
                res = [compare(o, e, w["tolerance"]) for o, e in zip(outs, exp)]
                okall = all(r[0] for r in res)
                tk = bench(lambda: lm.run(*inp, *outs, kernels=K))
                key = json.dumps(w["axes"])
                if key not in ref_times:
                    te = bench(lambda: ref.run(*inp))
                    tc = None
                    if cref is not None:
                        try:
                            tc = bench(lambda: cref(*inp))
                        except Exception as ex: tc = float("nan"); print("compile err", str(ex)[:200])
                    ref_times[key] = (te, tc)
                te, tc = ref_times[key]
                tb = min(te, tc) if tc and not math.isnan(tc) else te
                status = "OK " if okall else "BAD"
                det = "" if okall else " " + " | ".join(f"{n}: ratio {r[1]:.5f} maxerr {r[2]:.3g} worst {r[3]}" for n, r in zip(defn["outputs"], res))
                line.append(f"  {status} {vals} {w['axes']} seed {tk*1000:.1f}us eager {te*1000:.1f}us" +
                            (f" compile {tc*1000:.1f}us" if tc else "") + f" speedup {tb/tk:.2f}x{det}")
                del inp, exp, outs
            except Exception as ex:
                import traceback
                line.append(f"  ERR {vals} {w['axes']}: {traceback.format_exc()[-800:]}")
            torch.cuda.synchronize()
        print("\n".join(line), flush=True)
        torch.cuda.empty_cache()

if __name__ == "__main__":
    all_combos = os.environ.get("ALL", "0") == "1"
    do_compile = os.environ.get("COMPILE", "0") == "1"
    for p in sys.argv[1:]:
        try: main(p, all_combos, do_compile)
        except Exception as ex:
            import traceback; print("PROBLEM ERR", p, traceback.format_exc()[-1500:], flush=True)
