"""`dspark inspect`: the contract and tensor table of a checkpoint or artifact."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dspark_convert.cli.app import STATUS_STYLE, DebugOpt, JsonOpt, _out, app, escape, print_engines
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps
from dspark_convert.util.text import shown


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="A checkpoint directory, an artifact directory or a .gguf file.")],
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show the feature contract and the tensor table, writing nothing."""

    def body() -> int:
        from dspark_convert.commands.inspection import inspect_path

        result = inspect_path(path)
        if as_json:
            print(dumps(result.model_dump(), indent=2))
        else:
            _print_inspect(result)
        if result.problem is not None:
            sys.stderr.write(f"error: {shown(result.problem['message'])}\n")
            return result.problem_exit_code or 1
        return 0

    run(body, debug=debug, as_json=as_json)


def _print_inspect(result) -> None:
    c = result.contract
    out = _out()
    out.print(escape(f"{result.kind}: {result.path}"))
    if result.file is not None:                 # a .gguf file given alone
        out.print(f"  file          {escape(result.file)}")
        if result.retyped:
            out.print(f"  retyped       {escape('; '.join(result.retyped))}")
    if c is None:
        _print_gguf_tensors(out, result)
        return
    out.print(f"  family        {c.family} ({c.architecture})")
    summary = dict(c.summary())
    if hasattr(c, "headline"):      # a kind other than DSpark: its contract says every line
        for label, text in summary.items():
            out.print(f"  {label:<13} {escape(text)}")
        _print_rows(out, result)
        return
    out.print(f"  geometry      {escape(summary.pop('geometry'))}")
    out.print(f"  taps          {c.taps.target_layer_ids} of {c.taps.num_target_layers} target layers "
              f"(hidden_states {c.taps.hidden_state_indices}), feature width {c.taps.feature_width}")
    out.print(f"  block         size {c.block.block_size}, mask token {c.block.mask_token_id}, anchor first")
    for label, text in summary.items():        # the family's own lines: attention, ...
        out.print(f"  {label:<13} {escape(text)}")
    out.print(f"  markov head   {c.markov_head.type}" + (f", rank {c.markov_head.rank}" if c.markov_head.rank else ""))
    conf = "none"
    if c.confidence_head.enabled:
        conf = "with Markov features" if c.confidence_head.with_markov else "without Markov features"
    out.print(f"  confidence    {conf}")
    _print_rows(out, result)


def _print_rows(out, result) -> None:
    table = Table()
    first, second = ("source", "gguf") if result.kind == "checkpoint" else ("gguf", "source")
    for col in (first, second, "dtype", "shape", "expected", "status"):
        table.add_column(col)
    for row in result.rows:
        style = STATUS_STYLE[row.status]
        table.add_row(escape(row.name), escape(row.maps_to or "-"), escape(row.dtype or "-"),
                      escape(str(row.shape)) if row.shape is not None else "-",
                      escape(str(row.expected_shape)) if row.expected_shape is not None else "-",
                      f"[{style}]{row.status}[/]")
    out.print(table)
    if result.unexpected_not_listed:
        out.print(f"  ... and {result.unexpected_not_listed:,} more unexpected tensors (not listed)")
    if result.engines is not None:
        print_engines(out, result.engines)


def _print_gguf_tensors(out, result) -> None:
    """A GGUF file not of our format: its tensors as stored, and the engines' verdicts."""
    table = Table()
    for col in ("gguf", "type", "shape"):
        table.add_column(col)
    for row in result.tensors:
        table.add_row(escape(row.name), escape(row.type), escape(str(row.shape)))
    out.print(table)
    if result.tensors_not_listed:
        out.print(f"  ... and {result.tensors_not_listed:,} more tensors (not listed)")
    if result.engines is not None:
        print_engines(out, result.engines)
