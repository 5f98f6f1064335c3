"""Pulumi stack program entry (``Pulumi.yaml``: ``main: src/gpucloud/infra/``).

Only reads the stack's config and hands it to ``build_cluster`` — the same function
``gpucloud plan`` runs under mocks. A bad setting stops the deployment with the same one-line
messages ``gpucloud plan`` prints.
"""

from __future__ import annotations

import sys

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env

from gpucloud.errors import UserError
from gpucloud.infra.program import build_cluster
from gpucloud.spec import spec_from_config


def main() -> None:
    stack = pulumi.get_stack()
    config = {**get_config_env(), **CONFIG.get()}  # what `pulumi config` holds for this stack
    try:
        spec = spec_from_config(config, f"Pulumi.{stack}.yaml")
    except UserError as err:
        for line in str(err).splitlines():
            pulumi.log.error(line)
        sys.exit(err.exit_code)
    build_cluster(spec, stack).export()


main()
