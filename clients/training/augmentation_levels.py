"""The strengths of a site's training-image augmentation (run-config ``augmentation``).

Torch-free, like :mod:`clients.training.task_settings`, so that the run config is checked
without loading torch or MONAI; :mod:`clients.training.augmentation` builds the MONAI
transforms of a level.

The transforms are the ones a chest radiograph can plausibly undergo between two
acquisitions: a small rotation, zoom and shift (patient positioning), a contrast change
(exposure, processing) and sensor noise. No flip: a mirrored chest puts the heart on the
right (dextrocardia), which a classifier must not learn is normal.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.wire.registry import Registry

__all__ = ["AugmentationLevel", "AUGMENTATIONS"]


@dataclass(frozen=True)
class AugmentationLevel:
    """Ranges of one augmentation strength; every transform fires with ``probability``.

    Attributes
    ----------
    probability : float
        Chance that each transform is applied to an image.
    rotate_degrees : float
        Rotation drawn in ``[-rotate_degrees, rotate_degrees]`` (in-plane; about each axis
        of a volume).
    zoom : float
        Isotropic scale drawn in ``[1 - zoom, 1 + zoom]``.
    shift : float
        Translation per axis drawn in ``[-shift, shift]`` x the image side.
    noise_std : float
        Standard deviation of additive Gaussian noise (images are in [0, 1]).
    gamma : tuple of float
        Contrast gamma range of ``RandAdjustContrast``.
    """

    probability: float
    rotate_degrees: float
    zoom: float
    shift: float
    noise_std: float
    gamma: tuple[float, float]

    @property
    def applies(self) -> bool:
        """Whether any transform can fire (``none``'s probability is 0: the images as loaded)."""
        return self.probability > 0.0


#: Run-config ``augmentation`` -> its strength; ``none`` (no transform fires) trains on the
#: images as loaded.
AUGMENTATIONS: Registry[AugmentationLevel] = Registry("augmentation level", "augmentation")
AUGMENTATIONS.add("none", AugmentationLevel(probability=0.0, rotate_degrees=0.0, zoom=0.0,
                                            shift=0.0, noise_std=0.0, gamma=(1.0, 1.0)))
AUGMENTATIONS.add("light", AugmentationLevel(probability=0.5, rotate_degrees=5.0, zoom=0.05,
                                             shift=0.05, noise_std=0.01, gamma=(0.9, 1.1)))
AUGMENTATIONS.add("strong", AugmentationLevel(probability=0.8, rotate_degrees=10.0, zoom=0.1,
                                              shift=0.1, noise_std=0.03, gamma=(0.7, 1.4)))
