"""The optional C extensions; the package metadata is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and lavinpy runs its pure-Python
code (lavinpy.wire.accel and lavinpy.store.accel select the path at import).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("lavinpy.wire._cwire", ["lavinpy/wire/_cwire.c", "lavinpy/wire/_cwire_build.c",
                                                "lavinpy/wire/_cwire_peek.c", "lavinpy/wire/_cwire_mqtt.c",
                                                "lavinpy/wire/_cwire_dedup_table.c", "lavinpy/wire/_cwire_dedup_file.c",
                                                "lavinpy/wire/_cwire_round.c", "lavinpy/wire/_cwire_room.c",
                                                "lavinpy/wire/_cwire_pick.c", "lavinpy/wire/_cwire_stamped.c",
                                                "lavinpy/wire/_cwire_acks.c", "lavinpy/wire/_cwire_ack_read.c",
                                                "lavinpy/wire/_cwire_refill.c", "lavinpy/wire/_cwire_table.c",
                                                "lavinpy/wire/_cwire_props.c", "lavinpy/wire/_cwire_split.c",
                                                # (zlib's CRC-32 for the deduplication table's framed batches)
                                                "lavinpy/wire/_crc32.c"],
                  depends=["lavinpy/wire/_bytes.h", "lavinpy/wire/_cwire.h", "lavinpy/wire/_cwire_dedup_table.h",
                           "lavinpy/wire/_crc32.h", "lavinpy/wire/_dedup_batch.h", "lavinpy/wire/_props.h"],
                  optional=True, extra_compile_args=["-O2"]),
        Extension("lavinpy.wire._cclient", ["lavinpy/wire/_cclient.c", "lavinpy/wire/_cclient_recv.c",
                                                "lavinpy/wire/_cclient_columns.c"],
                  depends=["lavinpy/wire/_bytes.h", "lavinpy/wire/_cclient_scan.h", "lavinpy/wire/_props.h"],
                  optional=True, extra_compile_args=["-O2"]),
        Extension("lavinpy.wire._cstream", ["lavinpy/wire/_cstream.c"], depends=["lavinpy/wire/_bytes.h"],
                  optional=True, extra_compile_args=["-O2"]),
        # POSIX threads and sockets: not built where they are missing (the event loop then sends and
        # receives); the reader thread (an eventfd wakes the loop) only on Linux.
        Extension("lavinpy.wire._csocket", ["lavinpy/wire/_csocket.c", "lavinpy/wire/_csocket_reader.c"],
                  optional=True,
                  extra_compile_args=["-O2"]),
        Extension("lavinpy.amqp._cpublish", ["lavinpy/amqp/_cpublish.c"], optional=True, extra_compile_args=["-O2"]),
        Extension("lavinpy.store._cstore", ["lavinpy/store/_cstore.c", "lavinpy/store/_cstore_read.c",
                                             "lavinpy/store/_cstore_ready.c", "lavinpy/wire/_crc32.c",
                                             "lavinpy/store/_cstore_sync.c", "lavinpy/store/_cstore_posset.c",
                                             "lavinpy/store/_cstore_sizes.c", "lavinpy/store/_cstore_frames.c",
                                             "lavinpy/store/_cstore_order.c"],
                  depends=["lavinpy/wire/_crc32.h", "lavinpy/wire/_dedup_batch.h", "lavinpy/store/_cstore.h",
                           "lavinpy/wire/_bytes.h"], optional=True,
                  extra_compile_args=["-O2"]),
    ],
)
