"""The boundary to Pulumi's Automation API: the one place gpucloud drives the pulumi CLI.

``gpucloud teardown`` and ``gpucloud drill`` need three things from a deployed stack: its outputs,
a destroy with progress, and what the state still holds afterwards. ``StackHandle`` is exactly that,
so the decisions around the calls are tested with a fake handle; ``open_stack`` is the real one.

The Automation API is a driver for the pulumi CLI, not a replacement: every call runs
``pulumi <verb>`` in a subprocess, so the CLI must be on PATH
(https://www.pulumi.com/docs/iac/using-pulumi/automation-api/). Missing CLI, missing stack and a
failed command each become one ``UserError`` line, never a traceback with the CLI's whole output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpucloud.errors import UserError

if TYPE_CHECKING:  # importing pulumi costs seconds; only open_stack needs it
    from pulumi.automation import Stack

PULUMI_INSTALL_URL = "https://www.pulumi.com/docs/iac/download-install/"
STACK_TYPE = "pulumi:pulumi:Stack"
PROVIDER_TYPE_PREFIX = "pulumi:providers:"


@dataclasses.dataclass(frozen=True)
class StackResource:
    """One resource of the stack's state (``pulumi stack export``'s ``deployment.resources[]``)."""

    urn: str
    type: str
    id: str | None = None
    protected: bool = False  # ``protect: true``: a destroy refuses it (or, excluding protected, leaves it)

    @property
    def bookkeeping(self) -> bool:
        """The stack itself and provider instances: state entries that bill nothing in AWS."""
        return self.type == STACK_TYPE or self.type.startswith(PROVIDER_TYPE_PREFIX)


class StackOperationFailed(UserError):
    """A pulumi command against the stack failed; the message is its one telling line."""


class StackHandle(Protocol):
    name: str

    def outputs(self) -> dict[str, Any]:
        """The stack outputs of the last update, as plain values (secrets unwrapped)."""
        ...

    def destroy(self, *, on_output: Callable[[str], None], exclude_protected: bool, run_program: bool) -> None:
        """``pulumi destroy --yes``; each line of its progress goes to ``on_output``.
        ``exclude_protected``: leave resources with ``protect: true`` (and what they need) in place.
        ``run_program``: run the stack's program first (``--run-program``), which resource hooks need:
        the FSx export is a ``before_delete`` hook, and the engine refuses a destroy of a stack with
        delete hooks without it. Raises ``StackOperationFailed`` when the destroy fails."""
        ...

    def resources(self) -> list[StackResource]:
        """What the state still holds (after a destroy: what it could not delete)."""
        ...


def open_stack(stack: str, work_dir: Path | None = None) -> StackHandle:
    """Select the existing stack ``stack`` of the Pulumi project in ``work_dir`` (default: the
    nearest directory holding ``Pulumi.yaml`` from here up, else the repository's)."""
    project_dir = work_dir or find_project_dir()
    if not (project_dir / "Pulumi.yaml").is_file():
        raise UserError(f"{project_dir} holds no Pulumi.yaml; run from the Pulumi project directory")
    from pulumi import automation

    try:
        selected = automation.select_stack(stack_name=stack, work_dir=str(project_dir))
    except FileNotFoundError:  # PulumiCommand runs `pulumi version` first; no binary on PATH
        raise UserError(
            f"the pulumi CLI is not installed (not on PATH); the Automation API drives it: install it "
            f"from {PULUMI_INSTALL_URL} and log in to the stack's backend"
        ) from None
    except automation.errors.StackNotFoundError:
        raise UserError(
            f"no Pulumi stack named {stack!r} in the backend of {project_dir} (list them with `pulumi stack ls`)"
        ) from None
    except automation.errors.InvalidVersionError as err:
        raise UserError(f"the pulumi CLI is too old for the Automation API: {err}") from None
    except automation.errors.CommandError as err:
        raise StackOperationFailed(f"pulumi stack select {stack}: {command_error_line(str(err))}") from None
    return AutomationStack(selected)


def find_project_dir(start: Path | None = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / "Pulumi.yaml").is_file():
            return directory
    return Path(__file__).resolve().parents[3]  # the repository's own project


class AutomationStack:
    """``StackHandle`` over a ``pulumi.automation.Stack``."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self.name = stack.name

    def outputs(self) -> dict[str, Any]:
        return {key: output.value for key, output in self._run("stack output", self._stack.outputs).items()}

    def destroy(self, *, on_output: Callable[[str], None], exclude_protected: bool, run_program: bool) -> None:
        self._run(
            "destroy",
            lambda: self._stack.destroy(
                on_output=on_output, exclude_protected=exclude_protected, run_program=run_program
            ),
        )

    def resources(self) -> list[StackResource]:
        deployment = self._run("stack export", self._stack.export_stack).deployment or {}
        return resources_of(deployment)

    def _run(self, verb: str, call: Callable[[], Any]) -> Any:
        from pulumi.automation.errors import CommandError

        try:
            return call()
        except CommandError as err:
            raise StackOperationFailed(f"pulumi {verb} ({self.name}): {command_error_line(str(err))}") from None


def resources_of(deployment: Mapping[str, Any]) -> list[StackResource]:
    """The resources of an exported deployment (``pulumi stack export``'s ``deployment``)."""
    return [
        StackResource(
            urn=str(entry.get("urn", "")),
            type=str(entry.get("type", "")),
            id=entry.get("id") or None,
            protected=bool(entry.get("protect")),
        )
        for entry in deployment.get("resources") or []
    ]


def command_error_line(text: str) -> str:
    """The telling line of a failed pulumi command's output: its last ``error:`` line, else the
    last non-empty line (the CLI prints the diagnostic last, after the progress)."""
    lines = [_unlabelled(line) for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("code:")]
    errors = [line for line in lines if line.startswith("error:")]
    chosen = errors[-1] if errors else (lines[-1] if lines else "failed with no output")
    return chosen.removeprefix("error:").strip()[:400]


def _unlabelled(line: str) -> str:
    """``CommandResult`` prints `` stdout: ...`` / `` stderr: ...``; the label is not the message."""
    line = line.strip()
    for label in ("stdout:", "stderr:"):
        if line.startswith(label):
            return line.removeprefix(label).strip()
    return line
