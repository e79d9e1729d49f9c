"""Agent runners (command, Claude CLI, HTTP) that all yield one :class:`AgentReport`."""
