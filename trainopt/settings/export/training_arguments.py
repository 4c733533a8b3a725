"""The ``hf`` export: Hugging Face ``TrainingArguments`` from ``s.framework_args("hf")``.

The ``TrainingArguments(...)`` call is written from exactly the arguments
``s.trainer_kwargs("hf")`` builds, after ``output_dir``; the backend-flag lines come after it,
because ``TrainingArguments`` sets TF32 itself when it is built.
"""

from __future__ import annotations

from trainopt.settings.export.arguments import argument_lines, call_imports, unexpressed_lines
from trainopt.settings.export.lines import backend_lines, model_format_line
from trainopt.settings.production import TrainSettings

__all__ = ["render"]


def render(s: TrainSettings, header: list[str]) -> str:
    """Hugging Face ``TrainingArguments`` with every setting it has a field for; the rest as comments.

    Args:
        s: The settings.
        header: The comment lines to start with.
    """
    fa = s.framework_args("hf")
    lines = header + ["import torch", "from transformers import TrainingArguments", *call_imports(fa), ""]
    if s.distributed:
        lines.append(f"# run the script with: {s.launch_command()}")
    lines += [
        "args = TrainingArguments(",
        '    output_dir="out",  # your output folder',
        *argument_lines(fa, "    "),
        ")",
        *unexpressed_lines(fa, "TrainingArguments"),
        "",
        *backend_lines(s),
        model_format_line(s),
    ]
    return "\n".join(lines) + "\n"
