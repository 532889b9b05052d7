"""Operations: the ``eventbus`` console script and the cascade view.

May import every layer; reads and writes events only through the store protocol.
"""
