"""The lint rules, one per module, named after their code (``L001_log_of_probability``)."""
