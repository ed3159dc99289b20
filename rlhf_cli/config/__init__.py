"""Recipe + flags -> a validated, resolved run. Imports nothing heavy."""
