"""Typed errors raised by the site-side data layer.

Every error names the offending file (or folder) and the reason, so a site
operator can fix the data without reading a traceback. The hierarchy hangs off
the product's root (:mod:`strategies.wire.errors`): a loader skips one bad study
(:class:`StudyError` and its subclasses, an ``ItemError``) while a broken site
manifest (:class:`ManifestError`, a ``SiteError``) stops the whole site.
"""

from __future__ import annotations

from pathlib import Path

from strategies.wire.errors import ItemError, SiteError


class PathReason:
    """Mix-in: an error about one file or folder, with a short reason.

    Parameters
    ----------
    path : Path
        The offending file or folder.
    reason : str
        A short human-readable explanation.

    Attributes
    ----------
    path : Path
        The offending file or folder.
    reason : str
        A short human-readable explanation.
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[Path, str]]:
        # Keep the two-argument constructor picklable (multiprocessing, Ray).
        return (type(self), (self.path, self.reason))


class StudyError(PathReason, ItemError):
    """A study (or a file belonging to it) cannot be used; it is skipped."""


class DicomSeriesError(StudyError):
    """A DICOM series folder or one of its files is unusable."""


class MaskError(StudyError):
    """A NIfTI mask is unreadable or does not match its image volume."""


class ManifestError(PathReason, SiteError):
    """A site manifest is missing or malformed; the whole site is unusable."""


class LabelError(StudyError):
    """A manifest row's label is missing or outside the task's classes; only that item is skipped."""


class VolumeError(StudyError):
    """A classification volume is missing, unreadable, of an unsupported format or of the wrong dimensions."""


class RadiographError(StudyError):
    """A radiograph file is unreadable, corrupt, or not a single 2D grayscale image."""


class DicomResultError(StudyError):
    """A DICOM result (a SEG, an SR) cannot be made from its source: the source file or folder is
    not DICOM, or its instances do not fit the prediction; names the source."""
