"""Exit statuses of every client command (vectors, presets, slots); 2 is also argparse's usage
error."""

EXIT_OK = 0
EXIT_ERROR = 1  # any other failure: 404, 5xx (no engine, no space, ...), a transport error
EXIT_USAGE = 2  # bad arguments
EXIT_UNREACHABLE = 3  # cannot connect to the control API
EXIT_UNAUTHORIZED = 4  # HTTP 401/403: missing or wrong token
EXIT_CONFLICT = 5  # HTTP 409: the id exists (use --replace) or belongs to the engine
EXIT_INVALID = 6  # HTTP 400/413/415/422: the request or the vector was refused as invalid
EXIT_FILE = 7  # a local file is missing, unreadable or not the format it claims

EXIT_CODES = {EXIT_OK: "success", EXIT_ERROR: "other error (server message on stderr)",
              EXIT_USAGE: "bad arguments", EXIT_UNREACHABLE: "cannot connect to the control API",
              EXIT_UNAUTHORIZED: "unauthorized (HTTP 401): missing or wrong --token",
              EXIT_CONFLICT: "conflict (HTTP 409): the id exists; use --replace",
              EXIT_INVALID: "invalid (HTTP 400/413/415/422): vector or request refused",
              EXIT_FILE: "a local file is missing, unreadable or malformed"}
