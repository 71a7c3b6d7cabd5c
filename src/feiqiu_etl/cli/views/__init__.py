"""The terminal views, one module per view: :mod:`.summary` (a run's end), :mod:`.progress` (the live display),
:mod:`.plan`, :mod:`.runs`, :mod:`.show`, :mod:`.status`, :mod:`.freshness`, :mod:`.details`, :mod:`.tables`
(``sql``, ``tasks``), over what they share (:mod:`.console`). Rich only here and in :mod:`feiqiu_etl.cli`; a
view reads records and dicts and prints, it never queries."""
