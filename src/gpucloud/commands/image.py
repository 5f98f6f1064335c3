"""``gpucloud image``: check the pinned GPU image version matrix, render its Image Builder documents."""

from __future__ import annotations

from pathlib import Path

import click

from gpucloud.output import output_option, print_json, print_table

_STATUS_STYLE = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}


@click.group("image")
def image() -> None:
    """The GPU image recipe: images/versions.yaml pins every version the AMI is built from.

    \b
    gpucloud image check                      prove the pinned versions work together (--matrix FILE)
    gpucloud image render --out build/image   write the Image Builder documents to read or diff
    """


MATRIX_HELP = "Version matrix file (the same --matrix as `gpucloud doctor`).  [default: images/versions.yaml]"


@image.command("check")
@click.option("--matrix", "matrix_file", type=click.Path(dir_okay=False, path_type=Path), help=MATRIX_HELP)
@click.option(
    "--images-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Also render components/ and scripts/ from here for this matrix.  [default: this checkout's images/]",
)
@output_option()
def check(matrix_file: Path | None, images_dir: Path | None, output: str) -> None:
    """Check the version matrix (--matrix, default: images/versions.yaml) against the compatibility rules.

    Each rule prints pass, warn (a version newer than the known tables: check it by hand) or fail,
    with the two versions that clash and why. The Image Builder documents are rendered for the
    matrix too, so a broken component file is caught here rather than in a paid build. Exits 1
    when any rule fails, 2 when a file is unreadable or a document is malformed.

    \b
    Example:
      gpucloud image check --matrix images/versions.yaml --output json
    """
    from gpucloud.image.matrix import load_matrix
    from gpucloud.image.render import MAX_DOCUMENT_CHARS, default_image_dir, render_components
    from gpucloud.image.rules import check_matrix, failed

    matrix = load_matrix(matrix_file)
    results = check_matrix(matrix)
    images = images_dir or default_image_dir()
    components = render_components(matrix, images) if images.is_dir() else []
    if output == "json":
        print_json(
            {
                "file": str(matrix_file or "images/versions.yaml"),
                "rules": [r.to_dict() for r in results],
                "failed": len(failed(results)),
                "components": [{"name": c.name, "characters": len(c.document), "digest": c.digest} for c in components],
            }
        )
    else:
        print_table(
            "Image version matrix",
            ["Rule", "Status", "Detail"],
            [(r.rule, _STATUS_STYLE[r.status], r.detail) for r in results],
        )
        bad = failed(results)
        click.echo(f"{len(results)} rules, {len(bad)} failed" + ("" if bad else ", matrix is compatible"))
        if components:
            largest = max(len(c.document) for c in components)
            click.echo(
                f"{len(components)} Image Builder documents render from {images} "
                f"(largest {largest} of {MAX_DOCUMENT_CHARS} characters)"
            )
    if failed(results):
        raise click.exceptions.Exit(1)


@image.command("render")
@click.option("--matrix", "matrix_file", type=click.Path(dir_okay=False, path_type=Path), help=MATRIX_HELP)
@click.option(
    "--images-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Directory with components/ and scripts/.  [default: this checkout's images/]",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to write the rendered component documents and versions.env into.",
)
def render(matrix_file: Path | None, images_dir: Path | None, out_dir: Path) -> None:
    """Write the Image Builder component documents exactly as the image pipeline creates them.

    \b
    Example:
      gpucloud image render --out build/image && ls build/image
    """
    from gpucloud.errors import UserError
    from gpucloud.image.matrix import load_matrix
    from gpucloud.image.render import render_components, render_versions_env

    matrix = load_matrix(matrix_file)
    components = render_components(matrix, images_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "versions.env").write_text(render_versions_env(matrix), encoding="utf-8")
        for component in components:
            (out_dir / f"{component.name}.yaml").write_text(component.document, encoding="utf-8")
    except OSError as err:
        raise UserError(f"{out_dir}: cannot write the rendered documents: {err.strerror}") from None
    click.echo(f"wrote {len(components)} component documents and versions.env to {out_dir}")
