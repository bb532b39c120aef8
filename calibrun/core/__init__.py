"""What every part of calibrun stands on, none of it about quantisation: the error type and one-line errors
(errors), atomic files and temp folders (files), the bounds of every number a user gives (bounds), config nodes <->
dataclasses (fields), progress lines (progress), signals and interrupts (interrupts), the patches of other libraries'
internals (patches), the activation memory budget (memory), what a config may execute (trust)."""
