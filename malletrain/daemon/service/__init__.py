"""The running service: the observe -> decide -> act tick (:mod:`.daemon`), its main loop with
signals, reload and the metrics server (:mod:`.loop`, :mod:`.cli_daemon`), the coordinator
process beside it (:mod:`.coordinator_proc`) and what it reports (:mod:`.report`).

May import: every other room of the daemon; nothing imports it but the command line.
"""
