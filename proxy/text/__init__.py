"""The text library the providers share: facts a paraphrase would lose, prose surgery, summaries.

Below the providers: it imports only the runtime layer and the standard library.
"""
