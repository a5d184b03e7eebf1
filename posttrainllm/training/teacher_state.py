"""A teacher that trains along with the model (sdft's moving average, TRL's `teacher_model_kind="ema"`) is part of
the run's state: TRL keeps it in memory only, so a run resumed from checkpoint-N would start the teacher again from
the starting model and train on other targets than the uninterrupted run. Here each checkpoint holds the teacher's
weights (`checkpoint-N/moving_teacher.safetensors`, before the COMPLETE marker lists the files), and a resumed run
loads them."""

from __future__ import annotations

import os

TEACHER_FILE = "moving_teacher.safetensors"


class MovingTeacherMixin:
    """For trainers that build their own `teacher_model` (TRL's SDFTTrainer): the moving-average teacher, a model of
    its own, saved with each checkpoint and restored on resume. A frozen teacher (the starting model) or the model
    itself as teacher needs nothing."""

    def _moving_teacher(self):
        args = getattr(self, "args", None)
        teacher = getattr(self, "teacher_model", None)
        if getattr(args, "teacher_model_kind", None) != "ema" or teacher is None or teacher is self.model:
            return None
        return self.accelerator.unwrap_model(teacher)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        teacher = self._moving_teacher()
        if teacher is None or not self.args.should_save:
            return
        from safetensors.torch import save_model
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        save_model(teacher, os.path.join(folder, TEACHER_FILE))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        teacher, path = self._moving_teacher(), os.path.join(resume_from_checkpoint, TEACHER_FILE)
        if teacher is not None and os.path.isfile(path):
            from safetensors.torch import load_model

            load_model(teacher, path, device=str(next(teacher.parameters()).device))
