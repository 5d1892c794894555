"""Training: mdlm's objective unchanged (a subclass that only takes the family's name)."""

from dlmkit.families.mdlm.strategy import MDLMStrategy


class MaskPredictStrategy(MDLMStrategy):
    name = "maskpredict"
