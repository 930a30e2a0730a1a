"""The front end: Linnet text to a resolved program (grammar, parser, syntax tree, resolver)."""
