"""Every ``nanscope`` command, one module each (``main(argv) -> int``), registered in
``nanscope.cli.COMMANDS``; ``base`` and ``output`` hold what they share."""
