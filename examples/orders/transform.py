"""The orders transform: business-rule validation, then enrichment. Runs on Spark executors."""

from __future__ import annotations

from typing import Any

# Fixed rates keep the example deterministic: a replayed epoch must produce the same output.
EUR_RATES = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.04}
MAX_ITEMS = 1000


def rejection_reason(frame: Any) -> Any:
    """A column with the first rule an order breaks, or null for a valid order."""
    from pyspark.sql import functions as F

    return (
        F.when(F.col("amount") <= 0, F.lit("non_positive_amount"))
        .when(~F.col("currency").isin(*EUR_RATES), F.concat(F.lit("unknown_currency: "), F.col("currency")))
        .when((F.size("items") < 1) | (F.size("items") > MAX_ITEMS), F.lit("items_out_of_range"))
        .when(F.length(F.trim(F.col("customer"))) == 0, F.lit("empty_customer"))
    )


def validate_and_enrich(frame: Any) -> dict[str, Any]:
    """{sink: DataFrame}: valid orders (plus ``amount_eur``, and from the nested items their count and
    units) to PostgreSQL and Kafka, rejects with reasons."""
    from pyspark.sql import functions as F

    checked = frame.withColumn("reason", rejection_reason(frame))
    valid = checked.where(F.col("reason").isNull())
    rate = F.create_map(*[x for code, r in EUR_RATES.items() for x in (F.lit(code), F.lit(r))])
    # The nested items as Spark columns: how many lines, and the units over all of them.
    units = F.aggregate(
        F.transform("items", lambda item: item["qty"]), F.lit(0).cast("long"), lambda a, q: a + q
    )
    enriched = valid.withColumn("amount_eur", F.round(F.col("amount") * rate[F.col("currency")], 2)).select(
        "order_id",
        "customer",
        "amount",
        "currency",
        "placed_at",
        F.size("items").alias("item_count"),
        units.alias("quantity"),
        "items",
        "amount_eur",
    )
    size = (
        F.when(F.col("amount_eur") >= 500, "large")
        .when(F.col("amount_eur") >= 50, "medium")
        .otherwise("small")
    )
    kafka = enriched.select(
        F.col("customer").alias("key"),
        F.to_json(
            F.struct(
                "order_id",
                "customer",
                "amount",
                "currency",
                "placed_at",
                "items",
                "amount_eur",
                size.alias("size"),
            )
        ).alias("value"),
    )
    return {
        "orders_pg": enriched.select(
            "order_id",
            "customer",
            "amount",
            "currency",
            "placed_at",
            F.col("item_count").alias("items"),
            "quantity",
            "amount_eur",
        ),
        "orders_rejected": checked.where(F.col("reason").isNotNull()).select(
            "order_id", "reason", "_topic", "_offset"
        ),
        "orders_enriched": kafka,
    }
