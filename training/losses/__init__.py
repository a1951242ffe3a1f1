"""The training losses, one module each: MAE (normalised pixels on masked patches), the DINO
CLS-token loss with teacher centering, the KoLeo regulariser, and feature distillation
(projected student tokens against a frozen teacher's)."""

from training.losses.dino_clstoken_loss import DINOLoss
from training.losses.feature_distill_loss import FeatureDistillLoss
from training.losses.koleo_loss import KoLeoLoss
from training.losses.mae_loss import MAELoss

__all__ = ["DINOLoss", "FeatureDistillLoss", "KoLeoLoss", "MAELoss"]
