"""The reconcile pass as named steps (start with :mod:`.steps`), its ports and its errors.

``models`` and ``ports`` are pure; ``steps`` orchestrates them with the I/O it is handed;
``store`` is the database port, ``local`` the folder source and the local probe process,
``errors`` the typed errors with their reporting policy.
"""
