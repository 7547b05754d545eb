"""Recovery after pruning: healing by distillation or next-token loss (``healing``), MoP's short fine-tune
(``finetune``)."""
