"""The ``pyinit`` commands, one module each: ``add_arguments(parser)`` declares
its options and ``main(args) -> int`` does the command by calling the
package that owns the work. ``pyinit.cli`` lists them and imports only the
one that runs."""
