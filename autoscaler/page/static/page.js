// The operator page's charts: uPlot over the JSON data block the server rendered
// (autoscaler/page/charts.py). Times are epoch seconds, shown in UTC; money is cents.
(function () {
  "use strict";

  var data = JSON.parse(document.getElementById("chart-data").textContent);
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"];
  var HEIGHT = 220;

  var hourMinute = uPlot.fmtDate("{HH}:{mm}");
  var COUNTS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000];

  function utc(ts) {
    return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC");
  }

  function dollars(cents) {
    return "$" + (cents / 100).toFixed(2);
  }

  function constant(times, value) {
    return times.map(function () { return value; });
  }

  // One chart in the element `id`: `columns` are [times, ...values], `series` uPlot's
  // series options of the values.
  function draw(id, columns, series, valueAxis) {
    var target = document.getElementById(id);
    var options = {
      width: Math.max(320, target.clientWidth),
      height: HEIGHT,
      tzDate: utc,
      scales: { x: { time: true, range: [data.since, data.until] }, y: { range: function (u, min, max) { return [0, Math.max(1, max) * 1.1]; } } },
      axes: [
        { values: function (u, ticks) { return ticks.map(function (t) { return hourMinute(utc(t)); }); } },
        valueAxis,
      ],
      series: [{}].concat(series),
      legend: { live: false },
    };
    new uPlot(options, columns, target);
    target.setAttribute("data-drawn", String(series.length));
  }

  function perQueue(values, stepped) {
    var columns = [data.times];
    var series = data.queues.map(function (queue, i) {
      columns.push(values[queue]);
      var options = { label: queue, stroke: PALETTE[i % PALETTE.length], width: 2 };
      if (stepped) {
        options.paths = uPlot.paths.stepped({ align: 1 });
      }
      return options;
    });
    return [columns, series];
  }

  var counts = { incrs: COUNTS, values: function (u, ticks) { return ticks.map(String); } };
  var depth = perQueue(data.depth, false);
  draw("chart-depth", depth[0], depth[1], counts);
  var workers = perQueue(data.workers, true);
  draw("chart-workers", workers[0], workers[1], counts);

  var money = { size: 60, values: function (u, ticks) { return ticks.map(dollars); } };
  var cap = { stroke: "#d62728", width: 1, dash: [6, 4] };
  draw(
    "chart-spend-hour",
    [data.spend_times, data.last_hour_cents, constant(data.spend_times, data.hourly_cap_cents)],
    [
      { label: "last hour", stroke: "#1f77b4", fill: "rgba(31,119,180,0.1)", width: 2, value: function (u, v) { return v == null ? "-" : dollars(v); } },
      Object.assign({ label: "hourly cap", value: function (u, v) { return v == null ? "-" : dollars(v); } }, cap),
    ],
    money
  );
  draw(
    "chart-spend-day",
    [
      data.spend_times,
      data.today_cents,
      constant(data.spend_times, data.alert_threshold_cents),
      constant(data.spend_times, data.daily_cap_cents),
    ],
    [
      { label: "today", stroke: "#1f77b4", fill: "rgba(31,119,180,0.1)", width: 2, value: function (u, v) { return v == null ? "-" : dollars(v); } },
      { label: "alert threshold", stroke: "#ff7f0e", width: 1, dash: [2, 3], value: function (u, v) { return v == null ? "-" : dollars(v); } },
      Object.assign({ label: "daily cap", value: function (u, v) { return v == null ? "-" : dollars(v); } }, cap),
    ],
    money
  );
})();
