"""What the text tasks share: the SentencePiece tokenizer trained in the Beam job, reading text files
and JSON Lines, the Transformer's building blocks and their `make doctor` rules, and the public text
corpora that `make real-data` writes as JSON Lines. Not a task itself
(it has no task.py)."""
