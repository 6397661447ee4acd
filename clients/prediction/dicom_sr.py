"""A classifier's result as a DICOM TID 1500 Measurement Report (Comprehensive 3D SR), made with highdicom.

The report (DICOM PS3.16 TID 1500 Measurement Report, in a Comprehensive 3D SR
document, PS3.3 A.35.13) is one SR instance per item, in a series of its own, in
the source's study (its Patient and General Study modules copied, every source
instance in the Current Requested Procedure Evidence, PS3.3 C.17.2). It holds:

- the observation context (TID 1001): the model as the device observer (TID 1004:
  a UID derived from its name and version, its name, ``fedmed`` as manufacturer,
  name and version as model name);
- the image library (TID 1600): every source instance;
- per label one measurement group (TID 1501 Measurement and Qualitative Evaluation
  Group) tracked as ``label <j>`` (TID 4108), with the model as its algorithm
  (TID 4019: name, version), the source instances as its source images, and
  - the probability as a numeric evaluation (TID 300 Measurement, unit UCUM ``1``,
    no units; concept ``probability-<j>`` of the private coding scheme
    ``99FEDMED``, PS3.16 8.2: the product's labels have no standard code; the scheme is
    declared in the Coding Scheme Identification Sequence, PS3.3 C.12.1.1.2),
  - the label as a coded evaluation (concept ``label-<j>``; value SNOMED CT
    52101004 Present when the probability is at least :data:`THRESHOLD`, 272519000
    Absent otherwise): the ``predicted`` column of ``predictions.csv``.

The document is complete and unverified (Completion Flag COMPLETE, Verification Flag
UNVERIFIED, Preliminary Flag PRELIMINARY): a model's output awaiting a reader.
:class:`EvaluationContent` is what the classifier predictor hands ``make predict``
(:attr:`clients.prediction.predictor.ItemResult.dicom`); its
:meth:`~EvaluationContent.dataset` is the ``highdicom.sr.Comprehensive3DSR`` (a
``pydicom.Dataset``) that ``make predict`` saves and a PACS client can send as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import highdicom as hd
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid

from clients.errors import DicomResultError
from clients.prediction.dicom_source import MANUFACTURER, ModelIdentity, read_source_instances

__all__ = ["SR_SERIES_NUMBER", "THRESHOLD", "CODING_SCHEME", "probability_concept",
           "label_concept", "predicted_label", "measurement_report", "EvaluationContent"]

#: Series Number of the SR series (one per item; the source series keep theirs).
SR_SERIES_NUMBER = 902
#: A label is predicted present when its probability is at least this (the sigmoid's midpoint).
THRESHOLD = 0.5
#: The product's private coding scheme designator (PS3.16 8.2: private schemes begin with 99).
CODING_SCHEME = "99FEDMED"


def probability_concept(j: int) -> hd.sr.CodedConcept:
    """The concept name of label ``j``'s probability (a numeric evaluation)."""
    return hd.sr.CodedConcept(f"probability-{j}", CODING_SCHEME, f"Probability of label {j}")


def label_concept(j: int) -> hd.sr.CodedConcept:
    """The concept name of label ``j``'s predicted presence (a coded evaluation)."""
    return hd.sr.CodedConcept(f"label-{j}", CODING_SCHEME, f"Label {j}")


def predicted_label(probability: float) -> int:
    """1 when ``probability`` is at least :data:`THRESHOLD`, else 0."""
    return int(probability >= THRESHOLD)


def _group(j: int, probability: float, algorithm: hd.sr.AlgorithmIdentification,
           sources: list[Dataset]) -> hd.sr.MeasurementsAndQualitativeEvaluations:
    """TID 1501 for label ``j``: its probability (TID 300) and its predicted presence."""
    present = codes.SCT.Present if predicted_label(probability) else codes.SCT.Absent
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(uid=hd.UID(), identifier=f"label {j}"),
        algorithm_id=algorithm,
        measurements=[hd.sr.Measurement(name=probability_concept(j), value=float(probability),
                                        unit=codes.UCUM.NoUnits, algorithm_id=algorithm)],
        qualitative_evaluations=[hd.sr.QualitativeEvaluation(label_concept(j), present)],
        source_images=[hd.sr.SourceImageForMeasurementGroup.from_source_image(ds) for ds in sources])


def measurement_report(scores: tuple[float, ...], instances: list[Dataset], identity: ModelIdentity,
                       source: Path) -> hd.sr.Comprehensive3DSR:
    """The TID 1500 measurement report of one item's label probabilities over ``instances``.

    Parameters
    ----------
    scores : tuple of float
        The probability of each label, in [0, 1].
    instances : list of Dataset
        The source DICOM instances (:func:`~clients.prediction.dicom_source.read_source_instances`).
    identity : ModelIdentity
        The model that scored them.
    source : Path
        The source file or folder (named in errors).

    Raises
    ------
    DicomResultError
        If there is no score, a score is outside [0, 1], or highdicom refuses the
        sources (missing study or patient attributes), naming ``source``.
    """
    if not scores or not all(0.0 <= s <= 1.0 for s in scores):
        raise DicomResultError(source, f"probabilities {list(scores)} are not in [0, 1]; no SR written")
    algorithm = hd.sr.AlgorithmIdentification(name=identity.name, version=identity.version)
    device = hd.sr.DeviceObserverIdentifyingAttributes(
        uid=generate_uid(entropy_srcs=[identity.name, identity.version]), name=identity.name,
        manufacturer_name=MANUFACTURER, model_name=f"{identity.name} {identity.version}"[:64])
    context = hd.sr.ObservationContext(observer_device_context=hd.sr.ObserverContext(
        observer_type=codes.DCM.Device, observer_identifying_attributes=device))
    try:
        report = hd.sr.MeasurementReport(
            observation_context=context, procedure_reported=codes.SCT.ImagingProcedure,
            imaging_measurements=[_group(j, s, algorithm, instances) for j, s in enumerate(scores)],
            referenced_images=instances)
        document = hd.sr.Comprehensive3DSR(
            evidence=instances, content=report, series_instance_uid=hd.UID(),
            series_number=SR_SERIES_NUMBER, sop_instance_uid=hd.UID(), instance_number=1,
            manufacturer=MANUFACTURER, is_complete=True, is_final=False, is_verified=False)
    except (ValueError, AttributeError, TypeError) as exc:
        raise DicomResultError(source, f"no SR: highdicom refused the source instances "
                                       f"({type(exc).__name__}: {exc})") from None
    document.SeriesDescription = f"{identity.name} {identity.version}"[:64]
    document.SoftwareVersions = identity.software_version
    scheme = Dataset()
    scheme.CodingSchemeDesignator = CODING_SCHEME
    scheme.CodingSchemeName = "fedmed model outputs"
    scheme.CodingSchemeResponsibleOrganization = MANUFACTURER
    document.CodingSchemeIdentificationSequence = [scheme]
    return document


@dataclass(frozen=True)
class EvaluationContent:
    """One item's label probabilities and its source: what its measurement report is made of.

    Attributes
    ----------
    scores : tuple of float
        The probability of each label.
    source : Path
        The source DICOM file (a radiograph) or series folder (a CT volume).
    """

    scores: tuple[float, ...]
    source: Path

    #: The kind of object and the suffix of its file in ``make predict``'s ``dicom/`` folder.
    kind = "SR"
    suffix = ".sr.dcm"

    def dataset(self, identity: ModelIdentity) -> hd.sr.Comprehensive3DSR:
        """The SR (see :func:`measurement_report`), its source instances read from :attr:`source`.

        Raises
        ------
        DicomResultError
            If the source is not DICOM (a PNG, a NIfTI: it names no study to attach the
            report to) or is unreadable, naming it.
        """
        return measurement_report(self.scores, read_source_instances(self.source), identity,
                                  self.source)
