"""`openalign study NAME --out DIR`: the paper's arguments rerun in miniature (issue 7).

A study is a list of variants of one base training config; each variant trains for every seed into
DIR/runs/<variant>/seed<k>/ (a finished run is kept and not retrained, so a study resumes), and the
held-out metrics are reported as mean ± std over seeds: DIR/results.json, DIR/report.md, DIR/*.png.
"""

from openalign.study import ablation, compositional, dynamics, loss_batch, model_data, multilingual, noise_scale
from openalign.study.runner import Study, Variant, run_study

STUDIES: dict[str, Study] = {"ablation": ablation.STUDY, "noise-vs-scale": noise_scale.STUDY,
                             "model-vs-data": model_data.STUDY, "multilingual": multilingual.STUDY,
                             "compositional": compositional.STUDY, "dynamics": dynamics.STUDY,
                             "loss-batch": loss_batch.STUDY}
# --quick: about a minute per run on 2 CPU cores with the demo preset (measured: 100 steps at 48 px, 1.1 min,
# held-out mean recall 5.7x chance); no periodic evaluation or checkpoints: a short run is rerun whole
QUICK = ("train.steps=100", "train.eval_every=0", "train.checkpoint_every=0", "model.vision.image_size=48",
         "model.vision.resize_size=54")

__all__ = ["QUICK", "STUDIES", "Study", "Variant", "run_study"]
