"""A small service built on eventbus: ``ORDER_PLACED`` emits ``RECEIPT_SEND``, sent once."""
