"""The modelling toolkit every model family fits with: candidate terms (:mod:`.terms`), weighted
least squares and the estimator protocol with its one cross-validation loop (:mod:`.fitting`),
the term searches (:mod:`.modelers`: Brewer's t-tests, cross-validation, Extra-P's single term,
fixed) and the fitted model with its intervals (:mod:`.model`). Imports nothing of the
predictor above it: not the cost model, the families, the pilot or a command.
"""
