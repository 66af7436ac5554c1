"""Seed 004's cost model (Amato et al.): the cost functions F = max(F1, F2, F3) and the BSP
bounds (:mod:`.costfuncs`), the fitted model (:mod:`.costmodel`), the paper's and the improved fit
(:mod:`.fit`, the joint fit in :mod:`.joint`, its terms chosen by the toolkit's modelers), the
calibration of a machine profile from microbench results (:mod:`.calibrate`, :mod:`.variants`,
:mod:`.floor`) and the profile itself (:mod:`.profile`). Built on :mod:`predictor.toolkit`.
"""
