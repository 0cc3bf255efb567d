"""The consent wing: the consent stage, its store and the words a person reads.

- `stage.py`: the pipeline's consent stage (stored decisions, then the client's dialog, else
  the database question a terminal approver or the console answers);
- `store.py`: grants, denials and pending questions in the database; the words stored (`QuestionStatus`,
  `Channel`);
- `actions.py`: what a person does through any front end (decide a question, revoke a grant), row and event;
- `text.py`: the prompt a person is shown, escaped and cut (an upstream's tool: `upstream_preview`);
- `hints.py`: the MCP behaviour hints and their defaults;
- `grant_scope.py`: what a stored grant or denial covers.
"""
