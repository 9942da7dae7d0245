"""Wire format, request spec and mailbox layout, shared by the engine plugin and the control API.

No GPU code here: the control API imports this package without torch.
"""
