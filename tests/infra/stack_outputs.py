"""A stack's program run under the Pulumi mocks, with what it exports resolved (``preview_stack``
records the resources only; the outputs are what `gpucloud teardown` and `gpucloud drill` read)."""

from __future__ import annotations

from typing import Any

import pulumi

from gpucloud.infra.preview import RecordedResource, mocked_runtime, recorded_resources
from gpucloud.infra.program import build_cluster
from gpucloud.spec.model import ClusterSpec


def run_with_outputs(spec: ClusterSpec, stack: str) -> tuple[list[RecordedResource], dict[str, Any]]:
    """The resources the program registers and its stack outputs, resolved to plain values."""
    outputs: dict[str, Any] = {}

    @pulumi.runtime.test
    def run():
        build_cluster(spec, stack, None).export()
        exported = pulumi.runtime.settings.get_root_resource().outputs
        keys = sorted(exported)
        return pulumi.Output.all(*(exported[k] for k in keys)).apply(
            lambda values: outputs.update(zip(keys, values, strict=True))
        )

    with mocked_runtime(stack, spec.region, spec.availability_zone) as (_, monitor):
        run()
    return recorded_resources(monitor), outputs
