"""The operations Buffer exposes, one module per kernel family: Buffer -> op -> launcher -> cubins -> driver."""
