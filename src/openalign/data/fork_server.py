"""Imported only by the fork server of the data stages' workers (`workers.forkserver`'s preload): the kernel kills
the fork server when the process that started it dies. Importing this module anywhere else would tie that
process to its own parent, so nothing else imports it."""

from openalign.host import die_with_parent

die_with_parent()
