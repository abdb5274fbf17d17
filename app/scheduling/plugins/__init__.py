"""Filter and score plugins: one small module each; names in ``names``, constructors and
weights in ``registry``."""
