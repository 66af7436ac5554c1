"""The other seeds' model families, each fitted with :mod:`predictor.toolkit`: memory lines
touched (:mod:`.mlt`), memory logP (:mod:`.memlogp`, its costs in :mod:`.memlogp_costs`), the
convolution of a program's profile with the machine's (:mod:`.convolution`,
:mod:`.convolution_predict`) and Brewer's modelling and selection (:mod:`.select`).
"""
