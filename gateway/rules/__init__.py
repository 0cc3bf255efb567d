"""Claude Code's permission rules, read as pure functions (no I/O, no database).

- `permissions.py`: the rule grammar (`Bash(npm test:*)`, `Read(//etc/**)`, `WebFetch(domain:…)`)
  and whether a tool use is covered;
- `files.py`: path rules for the file tools;
- `hosts.py`: hosts in URLs and in `domain:` rules, read as a browser reads them;
- `code_runners.py`: programs that run code given as an argument;
- `shell/`: the Bash readers.

The prompt that uses them (gateway/permission_prompt.py) sits above the pipeline; these sit
below everything but the kernel modules, and import nothing of the gateway but `gateway.rules`.
"""
