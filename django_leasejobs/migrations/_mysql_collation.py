"""The binary collation MySQL/MariaDB key-like columns get (migrations 0007 and 0011)."""

KEY_COLLATIONS = ("utf8mb4_0900_bin", "utf8mb4_nopad_bin", "utf8mb4_bin")


def key_collation(cursor):
    """The first of ``KEY_COLLATIONS`` the server has: byte-for-byte comparison, NO PAD
    where the server offers it."""
    cursor.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN "
        f"({', '.join(['%s'] * len(KEY_COLLATIONS))})",
        list(KEY_COLLATIONS),
    )
    found = {name for (name,) in cursor.fetchall()}
    return next(name for name in KEY_COLLATIONS if name in found)
