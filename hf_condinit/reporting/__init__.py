"""What a run tells about itself: the files it leaves (:mod:`.runs`), its figures (:mod:`.plots`) and its model card
(:mod:`.model_card`). ``hf_condinit.compare`` puts several runs side by side;
``hf_condinit.callbacks.RunReportCallback`` writes the figures and the card when training ends.
"""
