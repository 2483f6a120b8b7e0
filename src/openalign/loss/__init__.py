"""ALIGN's contrastive loss and its alternatives, one module per loss kind, each owning its learned scalars, its
single-process, chunked and gathered forms and its config rules (loss/base.py's `Loss`):

    softmax.py   the paper's normalized softmax (loss.kind=softmax)
    sigmoid.py   SigLIP's pairwise sigmoid with its learned bias (loss.kind=sigmoid)
    filip.py     the softmax plus FILIP's late interaction over token vectors (loss.kind=filip)

The step asks `create(cfg.loss, world)` for the configured loss and calls it. Adding a kind: its module (a `Loss`
subclass decorated with `@register`) and its line below; nothing else names it.
"""

from openalign.loss.base import (DIRECTIONS, Loss, at_least_fp32, chunk_rows, chunked, create, kind_of,
                                 parameter_of, register, smoothed_cross_entropy, temperature_of)
# the kinds: importing a module registers its loss
from openalign.loss import softmax, sigmoid, filip
from openalign.loss.filip import filip_loss, late_interaction, late_interaction_pairs
from openalign.loss.sigmoid import (chunked_sigmoid_loss, naive_sigmoid_loss, sigmoid_loss,
                                    softplus_rows, softplus_sum)
from openalign.loss.softmax import (chunked_cross_entropy, contrastive_loss, negatives_mask,
                                    softmax_loss)

__all__ = ["DIRECTIONS", "Loss", "at_least_fp32", "chunk_rows", "chunked", "create",
           "kind_of", "parameter_of", "register", "smoothed_cross_entropy", "temperature_of", "softmax", "sigmoid",
           "filip", "filip_loss",
           "late_interaction", "late_interaction_pairs", "chunked_sigmoid_loss", "naive_sigmoid_loss", "sigmoid_loss",
           "softplus_rows", "softplus_sum", "chunked_cross_entropy", "contrastive_loss", "negatives_mask",
           "softmax_loss"]
