"""Calibration from the user's own measurements (``trainsim calibrate``, ``trainsim compare``).

One idea per module: :mod:`.kineto` reads a PyTorch profiler trace, :mod:`.kinds` names what each GPU
kernel is, :mod:`.matcher` pairs the trace's ops with the traced model's tasks, :mod:`.fit_kernels` fits
the cost model's efficiencies, :mod:`.nccl_log` reads nccl-tests output, :mod:`.fit_nccl` fits the NCCL
constants, :mod:`.fit_measured` fits what one end-to-end number leaves free, :mod:`.profile` writes the
profile and :mod:`.compare` reports predicted against measured.
"""


class CalibrationInputError(ValueError):
    """An input file is not what calibration needs; the message is one line naming the file and why."""
