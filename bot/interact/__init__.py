"""Slack interactivity: slash commands and buttons, over public HTTP or Socket Mode, into one dispatcher.

- `verify`: Slack's request signature (slack_sdk's SignatureVerifier) and a memory of what was seen (replays);
- `access`: roles from Slack user ids and user groups, and who may do what;
- `dispatch`: the table of commands and buttons, with permission checks and the audit log around each;
- `commands`: the built-in commands and buttons (list, ack, unack, silence, silences, unsilence, status, help);
- `silences`: silences in Alertmanager for an alert, and the periodic check that notices when one ends;
- `transport`: the answer within Slack's 3 s, later ones through response_url, and the HTTP and Socket Mode ends.
"""
