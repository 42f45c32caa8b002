"""Commands that drive or study runs rather than serve in one: launch a run on this machine, plan a
fleet and the learner's memory, run the ablation ladder, evaluate a model, report on runs, and write
the metrics reference."""
