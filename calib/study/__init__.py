"""What every study script shares, one concern a module, each importing only those above it in this list:

- :mod:`calib.study.presets`: the presets (``quick``, ``medium``, ``full-cpu``, ``paper``) and a preset's base config;
- :mod:`calib.study.paths`: where a study writes (store, artifacts, data, local outputs);
- :mod:`calib.study.sources`: what it runs on (the preset with the flags applied, the Stage-I source, the setups)
  and its trial configs (``trial_config``);
- :mod:`calib.study.resources`: where and with what its trials run (resources checked against Ray's, the settings
  line);
- :mod:`calib.study.settings`: ``--set KEY=VALUE`` and ``--stage2-seeds`` applied to the trial configs a study built;
- :mod:`calib.study.flags`: the flags every study shares and the parser;
- :mod:`calib.study.row`: a table's row (a loss, a method, Stage-I changes);
- :mod:`calib.study.row_file`: a row written to and read from a file (a search's choice, ``--row FILE``);
- :mod:`calib.study.rows`: row-based studies (a table's rows from the registries, run and print them);
- :mod:`calib.study.ablation`: ablation ladders;
- :mod:`calib.study.main`: a study script's exits (``guarded_main``, ``study_exit_code``);
- :mod:`calib.study.declaration`: a study declared once (``declare_study``: name, question, rows, table metrics,
  figure; registered in :data:`calib.registries.STUDIES`) and a row study's run (``run_row_study``).

A study script in ``studies/`` imports what it needs from these modules; this package imports none of them.
"""
