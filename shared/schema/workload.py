"""Workload: concrete axis values, where each input comes from, and the tolerance."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import AliasChoices, ConfigDict, Field, NonNegativeInt, model_validator

from shared.schema.base import Frozen, NonEmptyStr


class RandomInput(Frozen):
    type: Literal["random"] = "random"


# NaN and infinities would be written back as `null` (JSON has neither), which does not load.
FINITE = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ScalarInput(Frozen):
    model_config = FINITE

    type: Literal["scalar"] = "scalar"
    value: Union[bool, int, float]


class SafetensorsInput(Frozen):
    """`path` is relative to the problem's folder."""

    type: Literal["safetensors"] = "safetensors"
    path: NonEmptyStr
    tensor_key: NonEmptyStr


class CustomInput(Frozen):
    """Made by the definition's `custom_inputs_entrypoint`; all of a workload's inputs or none."""

    type: Literal["custom"] = "custom"


InputSpec = Annotated[
    Union[RandomInput, ScalarInput, SafetensorsInput, CustomInput], Field(discriminator="type")
]


class Tolerance(Frozen):
    """Per element `|out - ref| <= max_atol + max_rtol * |ref|`; the workload passes when at
    least `required_matched_ratio` of the elements do and none exceeds `max_error_cap`.

    The published SOL-ExecBench data spells the ratio both `required_matched_ratio` and
    `required_match_ratio`; both are read, the first is written.
    """

    model_config = FINITE

    max_atol: float = 1e-2
    max_rtol: float = 1e-2
    required_matched_ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        validation_alias=AliasChoices("required_matched_ratio", "required_match_ratio"),
    )
    max_error_cap: float | None = None
    allow_negative_inf: bool = False
    sampling_validation_trials: NonNegativeInt | None = None
    sampling_tvd_threshold: float | None = None


class Workload(Frozen):
    uuid: NonEmptyStr
    axes: dict[str, NonNegativeInt]
    inputs: dict[str, InputSpec]
    tolerance: Tolerance | None = None
    correctness: Tolerance | None = None

    @model_validator(mode="after")
    def _check(self) -> Workload:
        custom = [n for n, s in self.inputs.items() if isinstance(s, CustomInput)]
        if custom and len(custom) != len(self.inputs):
            raise ValueError(f"custom inputs {custom} cannot be mixed with other input types")
        if self.tolerance is not None and self.correctness is not None:
            raise ValueError("give `tolerance` or `correctness`, not both")
        return self

    @property
    def effective_tolerance(self) -> Tolerance:
        return self.tolerance or self.correctness or Tolerance()
