"""Pilot forecasts: from runs of a program at small input sizes, what each superstep of a run at
a large size will cost, and why (seed 004, Amato et al., section 5.4 and Table 4: counters
measured at small sizes, extrapolated to the target, fed to F).

The pure part takes the supersteps of pilot runs (:class:`~predictor.pilot.runs.PilotRun`, read
from ``counterd record`` files), checks that they line up, fits one growth model per superstep
for every counter and for the work time with the modelling toolkit, extrapolates them to the
target size with prediction intervals, and evaluates F with a machine profile on the
extrapolated counters. One home each:

- :mod:`predictor.pilot.runs`: the pilot runs and their check;
- :mod:`predictor.pilot.extrapolation`: one quantity from the pilot sizes to the target;
- :mod:`predictor.pilot.choice`: held-out errors, the forecast printed, its interval, advice;
- :mod:`predictor.pilot.mixed`: pilot runs not all of one regime (CPU sharing, a rise);
- :mod:`predictor.pilot.forecast`: every superstep at the target;
- :mod:`predictor.pilot.check`: ``--check``, measured against forecast;
- :mod:`predictor.pilot.campaign`: running the pilots under ``counterd record`` (not pure);
- :mod:`predictor.pilot.cli`: ``predict --pilot``.

Choices, each stated where a forecast is printed:

- Growth models come from the toolkit's ``single`` modeler by default: a constant plus the one
  growth term n^a log2(n)^b (Extra-P's normal form) with the best cross-validated MRE, both
  coefficients >= 0. Pilot campaigns have few sizes (3 to 5), too few for t-tests over a long
  term list.
- Counters are extrapolated as their sum over processors; each processor's share is the one it
  had in the largest pilot run (balanced SPMD programs keep their shares as n grows). F1 takes
  the maximum over processors, so the shares matter; F2 and F3 read sums.
- A counter that is zero in every pilot run is zero at the target (it was counted, and never
  happened). One with fewer than three non-zero pilot values is scaled linearly from the
  largest pilot run, and says so.
- F's interval is F evaluated on the counters' interval bounds (F does not decrease in any
  counter: its costs are >= 0). It covers the extrapolation, not F's own error on this host,
  which the profile's accuracy gives.
- Two times per superstep, as :class:`counterd.data.records.Superstep` gives them from every timed
  run: the *work*, the slowest processor's own time (its end minus its begin,
  ``slowest_work_ns``), which is what F and the counters predict, and the *span*, last end minus
  first begin (``time_ns``). What lies between them, the *extra* (start skew and the waits of
  whichever processor ended last), is its own term
  (:func:`~predictor.pilot.extrapolation.extrapolate_extra`): it does not scale with the work (a
  process's first superstep begins after its own start-up, tens of milliseconds apart from
  another's, whatever n is), so it is forecast as the median of the pilot runs' extras with
  their spread as the interval, unless the pilot runs show it growing with n (Kendall's tau,
  one-sided p < :data:`~predictor.pilot.extrapolation.GROWTH_P`), when it is extrapolated with a
  growth model and a note says so. The forecast printed first is the work's; the span's is the
  work's plus the extra, its interval the sum of their bounds.
- Beside F, three forecasts of the work time itself: *scaled*, the largest pilot's work time per
  instruction times the instructions extrapolated
  (:func:`~predictor.pilot.extrapolation.scale_by_work`); *fit*, a fixed cost plus the counted
  work fitted on the pilot runs with the toolkit's term search
  (:func:`~predictor.pilot.extrapolation.fit_work`); and *time-only*, a growth model of the work
  time (what a user would do without counters). On the BSP sorts (``bench/pilot_forecast.py``)
  scaling by the counted instructions brought the median E at the paper's targets from 1.23
  (time-only) to 1.08: pilot sizes that cross a cache level bend the time curve, and a growth
  model of the time extrapolates the bend, while the counted instructions grow as the algorithm
  does. Scaling is a line through the origin, though, and multiplies a fixed cost with the work:
  the fit keeps it apart.
- Which one is printed (:attr:`~predictor.pilot.forecast.StepForecast.basis`,
  :func:`~predictor.pilot.choice.choose`): each predicts the pilot sizes from the third on from
  the sizes below them (:func:`~predictor.pilot.forecast.holdout_forecasts`); the one that
  missed them least (root mean square) replaces the standing one (scaled where counted, the fit
  where it found a fixed cost) where it missed less by more than three times a held-out error's
  timing noise. The interval comes from the timing spread, the distance to the target, how
  short the largest pilot is and how far the printed forecast missed the held-out pilots
  (:func:`~predictor.pilot.choice.interval_half`);
  :func:`~predictor.pilot.choice.advise` warns of pilots too short or too noisy and proposes
  sizes that would do.
"""
