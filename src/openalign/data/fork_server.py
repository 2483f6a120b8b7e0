"""Imported only by the fork server of the data stages' workers (`workers.forkserver`'s preload): the kernel kills
the fork server when the process that started it dies. Importing this module anywhere else would tie that
process to its own parent, so nothing else imports it.

The workers it forks also reuse freed memory (`host.reuse_freed_memory`, inherited through fork): every image a
task decodes, resizes or encodes is a block above glibc's initial mmap threshold, which a fresh process maps and
unmaps (and the kernel zeroes) image by image. And they start with the readers loaded (`workers.load_readers`)."""

from openalign.host import die_with_parent, reuse_freed_memory

die_with_parent()
reuse_freed_memory()

from openalign.data.workers import load_readers  # noqa: E402 - after the server is tied to its parent

load_readers()
