"""Site-side readers and writers of file formats, task-agnostic (DICOM, NIfTI, radiographs, volumes)."""
