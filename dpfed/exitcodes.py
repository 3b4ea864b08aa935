"""Exit codes of the ``dpfed`` command, the same for every subcommand.

Scripts can rely on them: 0 success; 2 the command line or a config file is wrong; 3 a round
failed or did not converge; 4 a request was refused (policy, budget, signature); 5 a peer could
not be reached; 6 an optional part of dpfed is not installed; 7 an audit log did not verify
(an entry edited, deleted or reordered, a head not signed by the party's key); 1 anything else.
"""

OK = 0
ERROR = 1
USAGE = 2
ROUND_FAILED = 3
REFUSED = 4
UNAVAILABLE = 5
MISSING_EXTRA = 6
AUDIT_FAILED = 7
INTERRUPTED = 130
