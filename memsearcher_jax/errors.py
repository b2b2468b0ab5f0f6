"""One base class for every error caused by what the user gave us.

A config value, a command-line flag, a data file, a checkpoint or an index that is wrong
raises a subclass of `UserInputError` whose message names the thing and what was expected.
The CLI prints that message and exits 2, without a traceback; anything else is a bug and
keeps its traceback. (`retrieval` imports this module too: it has no dependencies.)
"""


class UserInputError(ValueError):
    """Bad user input: the message says what was wrong and what was expected."""

    exit_code = 2  # what the CLI exits with after printing the message
