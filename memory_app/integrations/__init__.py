"""Adapters for agent frameworks, each an optional extra imported only when used.

- ``memory_app.integrations.langchain``: ``DjangoChatMessageHistory`` for LangChain
  (``pip install django-memory-app[langchain]``).
- ``memory_app.integrations.agents``: ``MemorySession`` for the OpenAI Agents SDK
  (``pip install django-memory-app[agents]``).

The core never imports this package. For plain ``openai`` SDK code see ``memory_app.conversation``.
"""
