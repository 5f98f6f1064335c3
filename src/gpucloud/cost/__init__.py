"""What GPU time costs: prices in force, per-job dollars, the daily report, the goodput estimator."""
