"""``python -m eagle3nb.audit DRAFTER --model TARGET [--engine sglang|vllm] [--out DIR]
[--eval-dataset builtin:tinystories_mtbench]``: which
boundaries a drafter someone else trained expects, which each engine will feed it, and a corrected
copy with the ids that make each engine feed the measured best (:func:`eagle3nb.audit.core.run_audit`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from eagle3nb.audit.core import check_drafter, run_audit, summary_lines

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    drafter: Path = typer.Argument(..., help="drafter folder (config.json + model.safetensors)"),
    model: str = typer.Option(..., "--model", help="target model folder or name"),
    engine: Optional[str] = typer.Option(None, help="sglang or vllm: the engine you serve with"),
    out: Optional[Path] = typer.Option(None, help="folder for the corrected copy and audit.json"),
    k: int = typer.Option(4, min=1, help="draft tokens per cycle"),
    max_new_tokens: int = typer.Option(48, min=1, help="tokens per held-out prompt"),
    radius: int = typer.Option(1, min=0, help="candidate boundaries within this of the declared"),
    figure: bool = typer.Option(True, help="write audit.html beside audit.json (needs --out)"),
    eval_dataset: Optional[str] = typer.Option(
        None, help="also measure on this benchmark's turns, as 04 renders them (eval_dataset)"
    ),
    max_records: int = typer.Option(0, min=0, help="cap on eval_dataset records (0: all)"),
):
    """Audit DRAFTER's boundaries against the target MODEL."""
    try:
        prompts, target = None, None
        if eval_dataset:  # 12 held-out prompts (run_audit's default) and the benchmark's turns
            from eagle3nb.params import RunParams
            from eagle3nb.steps.audit.prompts import audit_prompts
            from eagle3nb.target import models

            p = RunParams(
                model=model, eval_dataset=eval_dataset, eval_max_records=max_records,
                eval_max_new_tokens=max_new_tokens, max_eval_prompts=12, interactive=False,
            )  # fmt: skip
            check_drafter(drafter, model)  # another target's drafter: refused before it loads
            target = models.load_target(model, "float32")
            prompts = audit_prompts(p, target)
        r = run_audit(
            drafter, model, out, engine, prompts, k, max_new_tokens, radius, target=target
        )
    except (ValueError, FileNotFoundError) as e:  # bad input: the message names the field and fix
        typer.echo(f"eagle3nb.audit: {e}", err=True)
        raise typer.Exit(2) from None
    for line in summary_lines(r):
        typer.echo(line)
    if out is not None and figure:
        from eagle3nb.viz.audit_plots import audit_figure
        from eagle3nb.viz.plots import save_html

        typer.echo(f"figure: {save_html(audit_figure(r), Path(out) / 'audit.html')}")


if __name__ == "__main__":
    app()
