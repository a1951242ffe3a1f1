"""The pretraining losses, one module each: MAE (normalised pixels on masked patches),
the DINO CLS-token loss with teacher centering, and the KoLeo regulariser."""

from training.losses.dino_clstoken_loss import DINOLoss
from training.losses.koleo_loss import KoLeoLoss
from training.losses.mae_loss import MAELoss

__all__ = ["DINOLoss", "KoLeoLoss", "MAELoss"]
